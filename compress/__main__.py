from compress.cli.main import main

main()
