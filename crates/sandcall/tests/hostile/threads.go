// Attacks the pids limit (max_processes) from Go: goroutines that each lock an OS
// thread and block in a system call, so Go must start a new thread for every one. The
// runtime must fail to make more threads than the limit, and the run end.
package main

import (
	"fmt"
	"runtime"
	"syscall"
)

func main() {
	for i := 0; i < 10000; i++ {
		go func() {
			runtime.LockOSThread()
			var ts = syscall.Timespec{Sec: 1000}
			syscall.Nanosleep(&ts, nil)
		}()
	}
	fmt.Println("started")
	select {}
}
