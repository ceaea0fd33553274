#!/bin/sh
# Makes throw-away TLS credentials for a gateway's TCP listener with
# openssl: a CA, a server certificate for 127.0.0.1/localhost and, per
# client Common Name (a VM name), a directory in the layout libnbd (fio's
# nbd engine, nbdinfo, nbdcopy: ?tls-certificates=DIR) and QEMU
# (tls-creds-x509 dir=DIR) read:
#
#   bench/tls-certs.sh DIR CN...
#
#   DIR/server/{ca-cert,server-cert,server-key}.pem   sluice gateway --tls-ca --tls-cert --tls-key
#   DIR/client-CN/{ca-cert,client-cert,client-key}.pem
#
# Valid for 2 days; for benchmarks and tests only (the CA key is left in DIR).
set -euf
[ $# -ge 1 ] || { echo "usage: bench/tls-certs.sh DIR CN..." >&2; exit 2; }
d=$1; shift
command -v openssl >/dev/null || { echo "tls-certs: openssl not found" >&2; exit 1; }
mkdir -p "$d/server"
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key "$d/ca-key.pem"
openssl req -x509 -new -key "$d/ca-key.pem" -subj "/CN=sluice test CA" -days 2 -out "$d/ca-cert.pem" 2>/dev/null
sign() { # KEY CN EXTFILE OUT
  openssl req -new -key "$1" -subj "/CN=$2" -out "$d/req.csr" 2>/dev/null
  openssl x509 -req -in "$d/req.csr" -CA "$d/ca-cert.pem" -CAkey "$d/ca-key.pem" -CAcreateserial -days 2 \
    -extfile "$3" -out "$4" 2>/dev/null
}
printf 'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/server.ext"
key "$d/server/server-key.pem"
sign "$d/server/server-key.pem" localhost "$d/server.ext" "$d/server/server-cert.pem"
cp "$d/ca-cert.pem" "$d/server/"
printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
for cn in "$@"; do
  mkdir -p "$d/client-$cn"
  key "$d/client-$cn/client-key.pem"
  sign "$d/client-$cn/client-key.pem" "$cn" "$d/client.ext" "$d/client-$cn/client-cert.pem"
  cp "$d/ca-cert.pem" "$d/client-$cn/"
done
rm -f "$d/req.csr" "$d/server.ext" "$d/client.ext"
