from bench.registry import main

main("store")
