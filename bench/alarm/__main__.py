from bench.common import main

main("alarm")
