"""The `p4bs` command: the top floor, wiring each part's subcommands (`main.build_parser`)."""
