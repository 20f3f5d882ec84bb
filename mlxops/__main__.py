from mlxops.cli import main

main()
