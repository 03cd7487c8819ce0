from memprobe.cli import main

main()
