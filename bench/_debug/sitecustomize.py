# On the device machine only (PYTHONPATH=bench/_debug:...): `kill -USR1 PID` prints every
# thread's Python stack to the process's stderr (its rank log), to see where a run hangs.
import faulthandler
import signal

faulthandler.register(signal.SIGUSR1, all_threads=True)
