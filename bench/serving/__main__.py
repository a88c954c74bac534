from bench.common import main

main("serving")
