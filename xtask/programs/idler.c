
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static volatile unsigned long sink;
static unsigned period;
__attribute__((noinline)) static void chore(unsigned long n) {
    for (unsigned long i = 0; i < n; i++)
        sink += i;
}
__attribute__((noinline)) static void wake(unsigned long n) {
    chore(n);
    sink++;
}
static void *helper(void *arg) {
    for (;;) {
        sleep(period);
        wake(100000);
    }
    return arg;
}
int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    period = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
    for (int i = 1; i < threads; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        if (pthread_create(&t, &attr, helper, NULL) != 0)
            return 1;
    }
    for (;;) {
        sleep(period);
        wake(1000000);
    }
}
