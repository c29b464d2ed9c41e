"""How the agents meet: this node's rendezvous (torch's c10d or etcd, with its state sealed and its
store bound to the job's address), the store watch that keeps every store call off the decision
loop, and the membership edges (hosts arriving apart, a job that already finished)."""
