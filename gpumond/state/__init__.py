"""What a daemon keeps on disk: crash-safe writes (`atomic`), versioned JSON state files read without ever raising
and bad ones set aside (`jsonfile`), JSON-lines audit logs (`audit`), one daemon per state directory (`dirlock`)."""
