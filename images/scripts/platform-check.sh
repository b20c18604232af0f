#!/usr/bin/env bash
# Exits 0 when this Docker daemon can build images for PLATFORM, 1 (saying why) when it cannot.
#   usage: platform-check.sh linux/amd64|linux/arm64
# Every image's build runs programs of the target architecture: apt-get, python3 and uv in its RUN steps, and
# the offline base's debootstrap (its second stage runs the new system's own binaries). BuildKit cross-builds
# without emulation only steps that run on the build platform (FROM --platform=$BUILDPLATFORM), and these steps
# install into the target's own system, so they cannot (images/README.md, "Platforms"). So a daemon builds
# PLATFORM when its CPU is PLATFORM's, or when the kernel runs PLATFORM's binaries through a binfmt_misc
# handler (QEMU user emulation, as Docker Desktop registers). The check asks the daemon itself: it builds a
# three-line image FROM scratch whose one RUN step is a static ELF (some 130 bytes, written here, so nothing is
# pulled) of PLATFORM's architecture that only exits 0. The image is removed again.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=images/scripts/docker.sh
source "$here/docker.sh"
platform=${1:?usage: platform-check.sh linux/amd64|linux/arm64}
case "$platform" in
  linux/amd64) machine=62 ;;   # EM_X86_64
  linux/arm64) machine=183 ;;  # EM_AARCH64
  *) echo "unsupported platform $platform (linux/amd64 or linux/arm64)" >&2; exit 2 ;;
esac
daemon=$("$DOCKER" version --format '{{.Server.Os}}/{{.Server.Arch}}')
if [ "$daemon" = "$platform" ]; then exit 0; fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
python3 - "$machine" "$context/exit0" <<'PY'
import struct, sys
machine, path = int(sys.argv[1]), sys.argv[2]
code = {
    62: bytes.fromhex("31ff" "b83c000000" "0f05"),  # xor edi,edi; mov eax,60 (exit); syscall
    183: bytes.fromhex("000080d2" "a80b80d2" "010000d4"),  # mov x0,#0; mov x8,#93 (exit); svc #0
}[machine]
base, header = 0x400000, 64 + 56
size = header + len(code)
elf = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
elf += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, base + header, 64, 0, 0, 64, 56, 1, 0, 0, 0)
elf += struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # one PT_LOAD, read + execute
with open(path, "wb") as f:
    f.write(elf + code)
PY
chmod 0755 "$context/exit0"
printf 'FROM scratch\nCOPY exit0 /exit0\nRUN ["/exit0"]\n' >"$context/Dockerfile"
tag=ftjob-platform-check:${platform//\//-}-$$
if log=$("${DOCKER_BUILD[@]}" --platform "$platform" -t "$tag" "$context" 2>&1); then
  "$DOCKER" image rm "$tag" >/dev/null 2>&1 || true
  exit 0
fi
"$DOCKER" image rm "$tag" >/dev/null 2>&1 || true
reason=$(grep -oiE 'exec format error|no such file or directory' <<<"$log" | head -n1 || true)
echo "$platform: this Docker daemon ($daemon) cannot run $platform programs (${reason:-see below}): no binfmt_misc" \
  "handler (QEMU user emulation) for it is registered, and every image's build runs programs of its target" \
  "architecture (apt-get, python3, uv; the offline base's debootstrap second stage). Register one (Debian:" \
  "apt-get install qemu-user-static binfmt-support) or build on a $platform machine." >&2
if [ -z "$reason" ]; then tail -n 20 <<<"$log" >&2; fi
exit 1
