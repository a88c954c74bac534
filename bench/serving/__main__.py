from bench.registry import main

main("serving")
