from bench.common import main

main("fit_temperature")
