from harness.cli import console_main

console_main()
