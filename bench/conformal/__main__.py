from bench.registry import main

main("conformal")
