from bench.common import main

main("shift")
