"""One module per subcommand; importing a module adds its command to :data:`harness.cli.cli`."""
