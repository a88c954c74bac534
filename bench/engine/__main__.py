from bench.registry import main

main("engine")
