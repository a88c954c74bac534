from bench.registry import main

main("auth")
