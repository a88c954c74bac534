from bench.common import main

main("auth")
