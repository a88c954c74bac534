from bench.registry import main

main("feedback_load")
