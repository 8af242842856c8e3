import sys


def spin():
    acc = 0
    while True:
        for i in range(10000):
            acc = (acc * 31 + i) & 0xFFFFFFFF


def down(n):
    if n <= 0:
        spin()
    down(n - 1)


down(int(sys.argv[1]) - 2)
