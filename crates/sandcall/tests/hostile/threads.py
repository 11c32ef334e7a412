# Attacks: the process table through threads. Starts 10,000 sleeping threads.
# Expect: the pids limit refuses most of them; the program survives to report.
import threading, time
started = 0
error = None
for _ in range(10_000):
    try:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        started += 1
    except Exception as e:
        error = type(e).__name__
        break
print(started, error)
