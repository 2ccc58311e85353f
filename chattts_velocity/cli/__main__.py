from chattts_velocity.cli.main import main

main()
