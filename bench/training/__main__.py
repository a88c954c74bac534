from bench.common import main

main("training")
