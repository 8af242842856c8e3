
static int ping[2], pong[2];

static void pin(void) {
    const char *cpu = getenv("OFFCPU_BENCH_CPU");
    if (!cpu)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(cpu), &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        abort();
}

static void *player(void *arg) {
    int me = (int)(long)arg;
    int in = me ? ping[0] : pong[0], out = me ? pong[1] : ping[1];
    char byte = 'x';
    pin();
    for (long r = 0; r < rounds; r++) {
        pthread_barrier_wait(&start);
        for (long i = 0; i < per_thread; i++) {
            if (me == 0 && write(out, &byte, 1) != 1)
                abort();
            if (read(in, &byte, 1) != 1)
                abort();
            if (me == 1 && write(out, &byte, 1) != 1)
                abort();
        }
        pthread_barrier_wait(&end);
    }
    return NULL;
}

