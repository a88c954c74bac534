from bench.common import main

main("profile")
