# shellcheck shell=sh
# Sourced by Dockerfile RUN steps that download something. A build may pass an extra CA bundle (system roots
# plus a TLS-intercepting proxy's CA) as the BuildKit secret `ca`; BuildKit mounts it at /run/secrets/ca for that
# one step only, so it never lands in a layer. Without the secret the tools' defaults apply.
# APT_CA_FILE is always set so Dockerfiles can pass it to apt unconditionally (apt reads it only for https
# sources, and the system bundle exists by then: ca-certificates is in every image's first package set).
APT_CA_FILE=/etc/ssl/certs/ca-certificates.crt
if [ -s /run/secrets/ca ]; then
  export SSL_CERT_FILE=/run/secrets/ca      # uv, OpenSSL-based tools
  export PIP_CERT=/run/secrets/ca           # pip
  export REQUESTS_CA_BUNDLE=/run/secrets/ca # requests-based tools
  export CURL_CA_BUNDLE=/run/secrets/ca     # curl
  APT_CA_FILE=/run/secrets/ca
fi
export APT_CA_FILE
