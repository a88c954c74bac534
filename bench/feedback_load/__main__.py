from bench.common import main

main("feedback_load")
