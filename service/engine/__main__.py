from service.engine.server import main

main()
