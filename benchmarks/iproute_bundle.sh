#!/usr/bin/env bash
# Bundle this machine's iproute2 (ip, tc, bridge) and sysctl, with the shared libraries they load, into
# DIR (default .iproute), for a machine that has the kernel features the testbed needs (network
# namespaces, veth, bridges, tbf) but not the tools, such as the lent GPU machines (docs/ps.md). Each tool
# runs through the dynamic loader with the bundled libraries, so nothing else on that machine sees them.
# Use there: export PATH=$PWD/DIR/bin:$PATH. Built on Debian 12 (glibc 2.36); the target's glibc must be
# at least as new (it ran on Ubuntu 24.04's 2.39).
set -euo pipefail
dir=${1:-.iproute}
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
for tool in ip tc bridge sysctl; do
    path=$(command -v "$tool" || echo "/usr/sbin/$tool")
    cp "$path" "$dir/bin/$tool.real"
    ldd "$path" | awk '$3 ~ /^\// && $3 !~ /\/lib(c|m)\.so/ {print $3}' | xargs -r -I{} cp -L {} "$dir/lib/"
    cat > "$dir/bin/$tool" <<WRAP
#!/bin/sh
d=\$(dirname "\$(readlink -f "\$0")")
exec /lib64/ld-linux-x86-64.so.2 --library-path "\$d/../lib" "\$d/$tool.real" "\$@"
WRAP
    chmod +x "$dir/bin/$tool"
done
"$dir/bin/ip" -V
