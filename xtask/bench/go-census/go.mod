module gocensus

go 1.19
