from bench.registry import main

main("profile")
