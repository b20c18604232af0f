"""Certificates and keys for a loopback control plane: one CA, one serving certificate, client certificates
per identity, and the service-account signing key. ECDSA P-256 keeps generation in milliseconds."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Test clusters live for minutes; a day of validity tolerates clock skew without lingering trust.
_VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A throwaway CA whose files live in `directory` (ca.crt, ca.key)."""

    def __init__(self, directory: Path, common_name: str = "ftjob-local-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pair = KeyPair(
            cert=_write(directory / "ca.crt", self._cert.public_bytes(serialization.Encoding.PEM), 0o644),
            key=_write(directory / "ca.key", _key_pem(self._key)),
        )

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """The CA already in `directory` (ca.crt, ca.key: a cluster's pki/), to issue more leaves from it."""
        ca = cls.__new__(cls)
        ca.directory = directory
        ca.pair = KeyPair(cert=directory / "ca.crt", key=directory / "ca.key")
        ca._cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
        key = serialization.load_pem_private_key(ca.pair.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{ca.pair.key}: expected an EC key, got {type(key).__name__}")
        ca._key = key
        return ca

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """Issue a leaf certificate; `organizations` become Kubernetes groups for client certificates."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert=_write(self.directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644),
            key=_write(self.directory / f"{stem}.key", _key_pem(key)),
        )


def service_account_keys(directory: Path) -> KeyPair:
    """Signing key (sa.key) for the apiserver's token issuer and the matching public key (sa.pub)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(cert=_write(directory / "sa.pub", pub, 0o644), key=_write(directory / "sa.key", _key_pem(key)))


def webhook_serving_pair(cert_dir: Path, common_name: str) -> KeyPair:
    """A throwaway CA (cert_dir/ca) and a serving pair for 127.0.0.1/localhost, written as the tls.crt and
    tls.key that controller-runtime's webhook server reads from its cert dir. Returns the CA pair (the
    caBundle of any webhook configuration pointing at that server)."""
    ca = CertificateAuthority(cert_dir / "ca", common_name=f"{common_name}-ca")
    serving = ca.issue("serving", common_name, dns_names=("localhost",), ips=("127.0.0.1",), server=True)
    _write(cert_dir / "tls.crt", serving.cert.read_bytes(), 0o644)
    _write(cert_dir / "tls.key", serving.key.read_bytes())
    return ca.pair
