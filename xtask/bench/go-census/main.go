// The goroutine census cost bench's Go target (`cargo xtask bench --holds-only`, issue 33).
// Usage: go-census GOROUTINES
//
// Starts GOROUTINES goroutines that block forever on an unbuffered channel send (started by
// main.block), prints `ready`, then a goroutine that sleeps 5 ms at a time measures the
// program's stops: each gap over 100 ms is printed as `gap MS` (leaktrace reads the goroutines
// from /proc/PID/mem without stopping the program: there should be none from it).
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func block(ch chan int, i int) {
	buf := make([]byte, 1024)
	buf[0] = byte(i)
	ch <- int(buf[0])
}

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	fmt.Printf("PID %d\n", os.Getpid())
	ch := make(chan int)
	for i := 0; i < n; i++ {
		go block(ch, i)
	}
	fmt.Println("ready")
	last := time.Now()
	for {
		time.Sleep(5 * time.Millisecond)
		now := time.Now()
		if ms := now.Sub(last).Milliseconds(); ms > 100 {
			fmt.Printf("gap %d\n", ms)
		}
		last = now
	}
}
