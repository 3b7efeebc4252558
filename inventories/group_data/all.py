"""Defaults for every host of every inventory (lowest-precedence group)."""

# Real hosts: a deploy user with passwordless sudo, and host keys checked against a file you maintain
# (add keys with `ssh-keyscan HOST >> inventories/known_hosts` after checking their fingerprints).
ssh_user = "ops"
ssh_strict_host_key_checking = "yes"
ssh_known_hosts_file = "inventories/known_hosts"
_sudo = True
