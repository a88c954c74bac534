from bench.registry import main

main("training")
