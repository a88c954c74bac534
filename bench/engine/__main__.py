from bench.common import main

main("engine")
