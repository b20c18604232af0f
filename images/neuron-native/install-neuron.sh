#!/bin/bash
# Installs the Neuron system side of the native (TorchNeuron) image in one layer: the Neuron runtime library,
# collectives and tools from the Neuron apt repository at the pinned versions, and the EFA user-space libraries
# (libfabric with the EFA provider; the kernel module comes from the host AMI). Leaves nothing of apt's behind.
#   install-neuron.sh RUNTIME_LIB_VERSION COLLECTIVES_VERSION TOOLS_VERSION EFA_INSTALLER_VERSION
# The versions are the ARG block of images/neuron-native/Dockerfile (one Neuron release, one place).
# Needs apt.repos.neuron.amazonaws.com and efa-installer.amazonaws.com.
set -euo pipefail
runtime_lib=${1:?usage: install-neuron.sh RUNTIME_LIB COLLECTIVES TOOLS EFA_INSTALLER}
collectives=${2:?collectives version}
tools=${3:?tools version}
efa=${4:?EFA installer version}
# /ftjob/ca-env.sh is images/common/ca-env.sh, bind-mounted by the Dockerfile.
# shellcheck source=images/common/ca-env.sh
. /ftjob/ca-env.sh
apt_ca=(-o "Acquire::https::CAInfo=${APT_CA_FILE}")
apt-get update "${apt_ca[@]}"
apt-get install -y --no-install-recommends "${apt_ca[@]}" curl gnupg openssh-client pciutils
# The repository's suite is the OS codename (resolute on Ubuntu 26.04).
# shellcheck source=/dev/null
. /etc/os-release
curl -fsSL https://apt.repos.neuron.amazonaws.com/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB \
  | gpg --dearmor -o /usr/share/keyrings/neuron.gpg
echo "deb [signed-by=/usr/share/keyrings/neuron.gpg] https://apt.repos.neuron.amazonaws.com ${VERSION_CODENAME} main" \
  >/etc/apt/sources.list.d/neuron.list
apt-get update "${apt_ca[@]}"
# apt's `=VERSION*` covers the Debian revision suffix of each package.
apt-get install -y --no-install-recommends "${apt_ca[@]}" \
  "aws-neuronx-runtime-lib=${runtime_lib}*" \
  "aws-neuronx-collectives=${collectives}*" \
  "aws-neuronx-tools=${tools}*"
work=$(mktemp -d)
curl -fsSL -o "$work/efa.tar.gz" "https://efa-installer.amazonaws.com/aws-efa-installer-${efa}.tar.gz"
tar -C "$work" -xf "$work/efa.tar.gz"
# The installer resolves its packages relative to its own directory; --skip-kmod: the host AMI has the module;
# --no-verify skips its check for an EFA device, which a build has none of.
(cd "$work/aws-efa-installer" && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify)
rm -rf "$work"
apt-get clean
rm -rf /var/lib/apt/lists/*
