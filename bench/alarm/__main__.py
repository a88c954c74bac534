from bench.registry import main

main("alarm")
