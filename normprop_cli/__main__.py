from normprop_cli.cli import main

main()
