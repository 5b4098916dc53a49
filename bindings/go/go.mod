module example.com/dsqwen

go 1.19
