from bench.common import main

main("conformal")
