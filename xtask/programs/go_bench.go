// The Go workload of `cargo xtask bench go`.
//
//	go_bench goroutines N   N goroutines parked four frames deep in a channel receive
//	                        (half of them under pprof labels), a 1 ms ticker that notes
//	                        its longest gap, and commands on stdin:
//	                          "dump"  -> "dump WALL_NS CPU_NS BYTES": the process's own
//	                                     pprof.Lookup("goroutine").WriteTo(w, 1), timed;
//	                          "gap"   -> "gap NS": the ticker's longest gap since the last
//	                                     "gap", then reset.
//	go_bench spin labels|plain
//	                        one goroutine spinning in main.spin, under
//	                        pprof.Do(handler=checkout) or not, until killed.
//
// Prints "ready" when set up.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var sink uint64

//go:noinline
func spin() {
	x := uint64(1)
	for {
		for i := 0; i < 1<<20; i++ {
			x = x*2862933555777941757 + 3037000493
		}
		atomic.StoreUint64(&sink, x)
	}
}

//go:noinline
func park3(ch chan struct{}) { <-ch }

//go:noinline
func park2(ch chan struct{}) { park3(ch) }

//go:noinline
func park1(ch chan struct{}) { park2(ch) }

func cpuNs() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func goroutines(n int) {
	ch := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for i := 0; i < n; i++ {
		labelled := i%2 == 0
		go func() {
			started.Done()
			if labelled {
				pprof.Do(context.Background(), pprof.Labels("handler", "checkout"), func(context.Context) { park1(ch) })
			} else {
				park1(ch)
			}
		}()
	}
	started.Wait()
	var gap int64
	go func() {
		last := time.Now()
		for now := range time.Tick(time.Millisecond) {
			if d := int64(now.Sub(last)); d > atomic.LoadInt64(&gap) {
				atomic.StoreInt64(&gap, d)
			}
			last = now
		}
	}()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "dump":
			var w counter
			wall, cpu := time.Now(), cpuNs()
			pprof.Lookup("goroutine").WriteTo(io.Writer(&w), 1)
			fmt.Println("dump", time.Since(wall).Nanoseconds(), cpuNs()-cpu, w.n)
		case "gap":
			fmt.Println("gap", atomic.SwapInt64(&gap, 0))
		}
	}
}

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "goroutines":
		n, err := strconv.Atoi(os.Args[2])
		if err != nil {
			panic(err)
		}
		goroutines(n)
	case len(os.Args) == 3 && os.Args[1] == "spin":
		fmt.Println("ready")
		if os.Args[2] == "labels" {
			pprof.Do(context.Background(), pprof.Labels("handler", "checkout"), func(context.Context) { spin() })
		}
		spin()
	default:
		fmt.Fprintln(os.Stderr, "usage: go_bench goroutines N | go_bench spin labels|plain")
		os.Exit(2)
	}
}
