
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_changed = PTHREAD_COND_INITIALIZER;
static int turn;

static void *player(void *arg) {
    int me = (int)(long)arg;
    const char *pin = getenv("FUTEX_BENCH_CPU");
    if (pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(pin), &set);
        if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
            abort();
    }
    for (long r = 0; r < rounds; r++) {
        pthread_barrier_wait(&start);
        for (long i = 0; i < per_thread; i++) {
            pthread_mutex_lock(&lock);
            while (turn != me)
                pthread_cond_wait(&turn_changed, &lock);
            turn = !me;
            pthread_cond_signal(&turn_changed);
            pthread_mutex_unlock(&lock);
        }
        pthread_barrier_wait(&end);
    }
    return NULL;
}

