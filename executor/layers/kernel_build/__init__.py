"""Building the C++ CPU kernels safely: what the compiler targets (`compiler_target.py`, the build
key) and the lock only a dead builder gives up (`build_lock.py`)."""
