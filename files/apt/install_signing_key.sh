#!/bin/sh
# Install the apt signing key published at URL as KEYRING (binary, 0644), refused unless the file holds
# exactly one primary key and that key has FINGERPRINT (its own subkeys are fine). Only that key is
# exported from a throwaway GnuPG home, so nothing else in the file (another key, a stray packet) reaches
# the keyring. Run on the node by deploys/ops.py keyring_verified; tests/unit/test_apt_keyring.py.
# usage: install_signing_key.sh URL FINGERPRINT KEYRING
set -eu
url=$1 fpr=$2 dest=$3
work=$(mktemp -d)
export GNUPGHOME="$work/gnupg"
trap 'gpgconf --kill all 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -m 0700 "$GNUPGHOME"

# the fingerprint of each primary key (public or secret) in a key file: the fpr line right after it
primaries() {
    gpg --batch --show-keys --with-colons "$1" 2>/dev/null |
        awk -F: '$1 == "pub" || $1 == "sec" { p = 1; next } p && $1 == "fpr" { print $10; p = 0 }'
}

curl -fsSL "$url" -o "$work/key"
found=$(primaries "$work/key" | tr '\n' ' ')
if [ "$found" != "$fpr " ]; then
    echo "key at $url refused: it must hold exactly one primary key, $fpr; it holds: ${found:-none}" >&2
    exit 1
fi
gpg --batch --quiet --import "$work/key"
gpg --batch --export "$fpr" > "$work/keyring.gpg"
if [ "$(primaries "$work/keyring.gpg")" != "$fpr" ]; then
    echo "key at $url refused: exporting $fpr did not give exactly that key" >&2
    exit 1
fi
install -D -m 0644 "$work/keyring.gpg" "$dest"
