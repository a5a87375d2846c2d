"""Local training loops and the runtime context phases receive."""
