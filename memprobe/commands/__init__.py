"""Front ends: one module per ``memprobe`` subcommand (each parses its flags into one
request record and calls one function), plus the pytest plugin."""
