// The goroutine census cost bench's Go target (`cargo xtask bench --holds-only`, issue 33).
// Usage: go-census GOROUTINES [OBJECTS]
//
// With OBJECTS, the package variable `nodes` keeps that many linked objects (the typed heap
// walk's cost: each reached from the slice and from the one before it).
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

type node struct {
	id   int
	next *node
	name string
}

var nodes []*node

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	if len(os.Args) > 2 {
		objects, _ := strconv.Atoi(os.Args[2])
		var prev *node
		for i := 0; i < objects; i++ {
			prev = &node{id: i, next: prev}
			nodes = append(nodes, prev)
		}
	}
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
