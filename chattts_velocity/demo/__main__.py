from chattts_velocity.demo.weights import main

main()
