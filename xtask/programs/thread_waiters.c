
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static long starts[65536], lates[65536];
static volatile long pauses;
static long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }
__attribute__((noinline)) long nest(int depth) {
    if (depth == 0) { pthread_mutex_lock(&lock); for (;;) pthread_cond_wait(&never, &lock); }
    return nest(depth - 1) + 1;
}
static void *sleeper(void *arg) { nest(8); return arg; }
static void *watchdog(void *arg) {
    for (;;) {
        struct timespec t = {0, 1000000};
        long start = now_ns();
        nanosleep(&t, NULL);
        long late = now_ns() - start - 1000000L;
        if (late > 200000 && pauses < 65536) { starts[pauses] = start; lates[pauses] = late; pauses++; }
    }
    return arg;
}
static void wake(int sig) { (void)sig; }
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    sigset_t usr1; sigemptyset(&usr1); sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    pthread_t t;
    for (int i = 0; i < n; i++) pthread_create(&t, NULL, sleeper, NULL);
    pthread_create(&t, NULL, watchdog, NULL);
    signal(SIGUSR1, wake);
    pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
    usleep(300000);
    printf("ready\n"); fflush(stdout);
    struct timespec forever = {86400, 0};
    nanosleep(&forever, NULL);
    for (long i = 0; i < pauses; i++) printf("pause %ld %ld\n", starts[i], lates[i]);
    fflush(stdout);
    _exit(0);
}
