from bench.registry import main

main("fit_temperature")
