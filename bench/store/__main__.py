from bench.common import main

main("store")
