"""Where specexec keeps what it builds and measures on this machine."""
