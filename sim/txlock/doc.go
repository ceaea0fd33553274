// Package txlock models transmission on one uplink of a host with many
// sending CPUs, to say where one HTB tree under one qdisc lock stops being
// enough at 25–100 GbE and what the two forms of docs/agent.md's plan buy
// (issue 27). It compares:
//
//   - FormSingleHTB: today's tree, one HTB as the uplink's root: every skb
//     of every CPU is enqueued and dequeued under one spinlock;
//   - FormPerQueueHTB: `mq` kept, one HTB per TX queue, each VM's skbs kept
//     on one queue chosen by the agent; lending between queues only at the
//     agent's interval (each queue root's rate re-set from alloc);
//   - FormEDTFQ: `mq` with `fq` on each queue, each skb stamped with its
//     earliest departure time from its VM's rate (re-set every interval),
//     the queue chosen by the sending CPU (XPS), no shared lock.
//
// A CPU spends a cost outside any lock per skb (stack, driver, the eBPF
// program), then waits for the lock of the qdisc it enqueues into (FIFO, as
// a queued spinlock: waiting burns the CPU) and holds it for the qdisc's
// cost per skb (enqueue and dequeue together). The link serializes at its
// rate and takes skbs from the queues round robin, each queue by its
// discipline (HTB's rate/ceil token buckets, or fq's timestamps). Every
// interval an agent measures each VM, estimates its demand as the live
// agent does (docs/agent.md "Dynamic enforcement") and sets the rates from
// package alloc's entitlements.
//
// txlock is pure, like the simulator's core: simulated time is an int64
// count of nanoseconds, the only randomness is one PCG generator seeded by
// Config.Seed (the jitter of the cost outside the lock, the offers of VMs
// with a finite demand), and it imports no
// time, os or net. The costs are parameters (Costs); CalibratedCosts holds
// the ones measured on the development machine, and says which are
// assumptions.
package txlock
