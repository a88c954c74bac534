from bench.registry import main

main("shift")
