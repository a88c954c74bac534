from bench.gpu import main

main()
